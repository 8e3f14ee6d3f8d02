"""pip in a real BuildKit build with the docker CLI's proxies configured (config.json `proxies`, which the CLI
gives every build as HTTP_PROXY / NO_PROXY build args) and an index on this machine: it asks the index directly,
never through the proxy (issue 60, item 10). uv's side of the same rule: test_lock_secrets.py."""

import http.server
import io
import json
import os
import subprocess
import tarfile
import threading

import pytest

from dockerlaunch import sim

pytestmark = pytest.mark.integration

TOKEN = "s3cr3t-build-token"


def recorder(seen: list[str]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            seen.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    return Handler


def test_pip_in_a_buildkit_build_asks_an_index_on_this_machine_directly_never_through_the_proxy(engine, tmp_path):
    from dockerlaunch.images import lock as locks
    from dockerlaunch.images.build_argv import BuildOptions, render_build
    from dockerlaunch.images.buildkit import find_cli
    from dockerlaunch.images.stacks import default_dockerfiles_dir, load_matrix

    seen: dict[str, list[str]] = {"index": [], "proxy": []}
    servers = {}
    for key, address in (("proxy", "127.0.0.2"), ("index", "127.0.0.1")):
        servers[key] = http.server.ThreadingHTTPServer((address, 0), recorder(seen[key]))
        threading.Thread(target=servers[key].serve_forever, daemon=True).start()
    proxy = f"http://127.0.0.2:{servers['proxy'].server_port}"
    index = f"http://ci:{TOKEN}@127.0.0.1:{servers['index'].server_port}/simple"
    config = tmp_path / "docker"
    config.mkdir()
    plugins = os.path.join(os.environ.get("DOCKER_CONFIG") or os.path.expanduser("~/.docker"), "cli-plugins")
    if os.path.isdir(plugins):  # a buildx the user installed for themselves, found as before
        (config / "cli-plugins").symlink_to(plugins)
    (config / "config.json").write_text(json.dumps({"proxies": {"default": {
        "httpProxy": proxy, "httpsProxy": proxy, "noProxy": "corp.example"}}}))
    env = {**os.environ, "DOCKER_CONFIG": str(config)}

    # what `dockerlaunch build --pip-index-url` passes, as its argv says
    stack = load_matrix().get("cpu")
    old = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(config)
    try:
        argv = render_build(stack, BuildOptions(pip_index_url=index), locks.checked(stack, default_dockerfiles_dir()))
        cli = find_cli()
    finally:
        if old is None:
            os.environ.pop("DOCKER_CONFIG")
        else:
            os.environ["DOCKER_CONFIG"] = old
    no_proxy = [a for i, a in enumerate(argv) if argv[i - 1] == "--build-arg" and a.lower().startswith("no_proxy=")]
    assert len(no_proxy) == 2, argv

    demo = sim.build_demo_image()  # python3 and pip, made here (no registry)
    dockerfile = (f"FROM {demo}\nRUN python3 -m pip download --no-deps --no-cache-dir -d /tmp/w --retries 0 "
                  f"--timeout 5 --index-url {index} dockerlaunch-nothing-here || true\n")
    ctx = io.BytesIO()
    with tarfile.open(fileobj=ctx, mode="w") as t:
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        t.addfile(info, io.BytesIO(dockerfile.encode()))

    def build(*args: str) -> None:
        r = subprocess.run([*cli.prefix, "--network", "host", "--no-cache", "--progress", "plain", *args, "-"],
                           input=ctx.getvalue(), capture_output=True, env={**env, **cli.env}, timeout=300)
        assert r.returncode == 0, r.stderr.decode(errors="replace")[-3000:]

    try:
        build()  # the control: as before, the config's proxy gets the loopback index's requests
        assert seen["proxy"] and not seen["index"], seen
        seen["proxy"].clear()
        build(*[a for x in no_proxy for a in ("--build-arg", x)])
        assert seen["index"], seen
        assert seen["proxy"] == [], f"the proxy was handed {len(seen['proxy'])} requests: {seen['proxy'][:3]}"
    finally:
        for server in servers.values():
            server.shutdown()
