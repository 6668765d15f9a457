"""Looking inside a trained model: the paper's Table 2 (top targets by table vs model), Fig. 3
(model scores against table scores) and Figs. 4-5 (maps of word and phrase representations);
for RNNsearch, its soft alignments (Bahdanau et al. 2015, Fig. 3) and BLEU by source sentence
length (their Fig. 2)."""
