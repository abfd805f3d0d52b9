"""One module per screen: launch, live, result, history, compare, monitor, help, confirm."""
