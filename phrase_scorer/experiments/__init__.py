"""The experiments that run the whole system: the paper's Table 1 (`table1`), rescoring Moses'
n-best lists (`rescoring`), their shared statistics and report parts (`statistics`, `report`),
and the step Moses' EMS runs (`ems`). They train, annotate and rescore with the models, so torch
is imported here, never in `phrase_scorer.moses` or `phrase_scorer.io`.
"""
