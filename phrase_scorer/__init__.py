"""phrase-scorer: the RNN Encoder-Decoder of Cho et al. (2014) as phrase-table features for Moses."""

__version__ = "0.1.0"
