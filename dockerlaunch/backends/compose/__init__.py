"""docker compose: one file per node from the job plan (`render --to compose`)."""

FLAGS = ()


def options(target: str, values: dict) -> None:
    return None


def render(plan, options=None) -> list:
    from dockerlaunch.backends.compose import files as compose

    return compose.render(plan)
