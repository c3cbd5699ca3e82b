"""xconf (report branch placeholder; main's package root replaces this on merge)."""
