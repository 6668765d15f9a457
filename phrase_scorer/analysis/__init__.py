"""Looking inside a trained model: the paper's Table 2 (top targets by table vs model), Fig. 3
(model scores against table scores) and Figs. 4-5 (maps of word and phrase representations)."""
