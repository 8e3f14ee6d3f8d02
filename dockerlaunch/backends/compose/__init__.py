"""docker compose: one file per node from the job plan (`render --to compose`)."""
