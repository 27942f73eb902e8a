"""Events on job and group state topics."""
