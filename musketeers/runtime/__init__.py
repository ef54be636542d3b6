"""What a process runs under, shared by the method and the run: its ranks (distributed), its
random streams (seeds) and the clock of its steps (step_profile)."""
