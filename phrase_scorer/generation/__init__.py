"""Generation: sampling target phrases, translating sentences, and the reranked Moses system."""
