"""accountant."""
