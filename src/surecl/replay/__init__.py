"""Replay: buffers, selection policies and the surprise scorer (the built-in policies: ``builtin.py``)."""
