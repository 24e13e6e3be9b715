"""`toolfence`: the command line, the local fleet it starts, and the demo."""
