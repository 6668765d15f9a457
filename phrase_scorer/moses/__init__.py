"""Driving the user's Moses: tuning (mert-moses.pl), decoding and evaluation, n-best lists
streamed from one Moses, binarising tables, patching a moses.ini. Plain Python and subprocess;
nothing here imports torch, not even inside a function (the experiments that need the models
live in `phrase_scorer.experiments`).
"""
