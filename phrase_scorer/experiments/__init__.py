"""The experiments that run the whole system, each in the module named for its verb: the paper's
Table 1 (`experiment`), what rescoring Moses' n-best lists buys (`rescore_experiment`), a
system's reranker in one command (`build_reranker`), the steps Moses' EMS runs (`ems_config`,
`ems_decoder`); the steps the two rescoring experiments share (`system_steps`), their checks
before the first step (`preflight`), statistics and report parts (`statistics`, `report`).
They train, annotate and rescore with the models, so torch is imported here, never in
`phrase_scorer.moses` or `phrase_scorer.io`.
"""
