"""Helpers shared by raylog's tests (imported as ``support.<module>``)."""
