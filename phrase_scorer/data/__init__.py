"""Training data and batching, one module per concept:

* :mod:`~phrase_scorer.data.padding` -- id sequences padded into rows (training, the scorer, the
  annotate workers; numpy only);
* :mod:`~phrase_scorer.data.cache` -- the on-disk pair cache both kinds of data are written to,
  its splits and :class:`~phrase_scorer.data.cache.PairSet`;
* :mod:`~phrase_scorer.data.batches` -- the epoch's batches of a split;
* :mod:`~phrase_scorer.data.phrase_pairs` -- the unique pairs of a Moses phrase table;
* :mod:`~phrase_scorer.data.sentence_pairs` -- a parallel corpus of sentences.
"""
