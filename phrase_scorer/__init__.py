"""phrase-scorer: the RNN Encoder-Decoder of Cho et al. (2014) and RNNsearch as features for Moses.

The packages (docs/layout.md): ``training``, ``scoring``, ``generation`` and ``runtime`` beside
``io`` (file formats), ``moses`` (Moses' programs), ``models``, ``data``, ``analysis``,
``experiments`` and ``cli``; at this level only what all of them share.
"""

__version__ = "0.1.0"
