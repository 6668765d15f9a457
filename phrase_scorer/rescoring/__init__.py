"""N-best rescoring, the larger of the two ways the models reach Moses: the list features
(``features``: the ``rescore`` verb), the weights and how a hypothesis is chosen (``weights``), the
reranker and its file (``reranker``), tuning it with Moses' optimisers (``tuning``, over
``mert_files`` and ``optimisers``), and its use on new text (``translation``, with
``bounded``: each sentence's best, scoring a model only where it can change the choice)."""
