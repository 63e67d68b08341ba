"""Imported by train_introspect.py from the script's own folder (sys.path[0])."""

HIDDEN = 16
