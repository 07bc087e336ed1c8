"""The work itself: one module per kind of activity, each bound to a pool; the libraries they use beside them."""
