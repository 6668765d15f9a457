"""The network architectures, each behind the interface of :mod:`phrase_scorer.models.base`.

:mod:`phrase_scorer.models.architectures` maps config.json's ``arch`` to the class.
"""
