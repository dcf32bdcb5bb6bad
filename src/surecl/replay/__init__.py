"""Replay: buffers, selection policies and the surprise scorer."""
