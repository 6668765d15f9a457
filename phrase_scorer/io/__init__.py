"""File formats of the Moses world: phrase tables, moses.ini, n-best lists.

Nothing in this package imports torch, so the Moses-side commands start at once.
"""
