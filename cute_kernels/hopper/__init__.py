"""hopper building blocks (see docs/)."""
