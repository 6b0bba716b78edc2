"""Training of MTP draft heads: data, target features, the training loop, export."""
