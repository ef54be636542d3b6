"""The experiment design, declared once: its parts and the grid files laid over it, read by the
grid runner and the analysis alike."""
