"""Generation: sampling target phrases and translating sentences with a model."""
