"""The runtime: devices, threads, processes, progress, resumable outputs and external programs.

No torch at import: moses/ uses the external programs here.
"""
