"""Entries that ship with hpctrain, so a new user can run something at once."""
