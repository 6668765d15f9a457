"""Driving the user's Moses: tuning (mert-moses.pl), decoding, evaluation and reranking. Plain
Python and subprocess; nothing here imports torch, not even inside a function (the experiments
that need the models live in `phrase_scorer.experiments`).
"""
