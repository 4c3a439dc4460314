"""Workers: one device each; the ModelRunner does the per-step work."""
