"""Green training (pure engine, no Django): power meters, energy accounting, grid carbon intensity,
carbon-aware scheduling and the figures a certificate is built from."""
