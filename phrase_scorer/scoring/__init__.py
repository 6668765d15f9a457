"""Scoring: the batch scorer, the columns Moses reads, and the score and annotate verbs."""
