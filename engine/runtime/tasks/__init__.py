"""Partition tasks: their lifecycle, their local SQLite store, the changelog restore and what
this process owns (`Assignment`)."""
