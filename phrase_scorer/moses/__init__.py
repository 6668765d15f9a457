"""Driving the user's Moses: tuning (mert-moses.pl), decoding and evaluation, and the paper's
Table 1 experiment. Plain Python and subprocess; nothing here imports torch.
"""
