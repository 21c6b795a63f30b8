"""Vision towers and what joins their output to a decoder's input embeddings."""
