"""attention building blocks (see docs/)."""
