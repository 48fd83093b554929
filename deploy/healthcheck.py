"""The images' HEALTHCHECK (deploy/Dockerfile): asks the container's main process whether it serves, as its role
allows. One image runs several roles, so the role is read from PID 1's command line:

- `dagster-webserver`: `GET /server_info` on its port answers 200;
- `dagster code-server start` / `dagster api grpc`: the gRPC health service reports `DagsterApi` SERVING;
- `dagster-daemon run`: `dagster-daemon liveness-check` (every daemon sent its heartbeat lately; it loads Dagster
  and reads the instance's storage, 2-3.5 s of CPU: docker-compose.yml checks the daemon every 2 minutes);
- `mirus api`: `GET /` on its port answers 200 (the one route that needs no token);
- anything else (a run's `dagster api execute_run`, `mirus task run`, a one-shot command): a live process is a
  healthy one — Dagster's run monitoring and the task leases watch those.

Exit status 0 healthy, 1 unhealthy, as Docker expects. Standard library only (and grpc, which a code server has),
so that a check costs a fraction of a second.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from collections.abc import Sequence
from pathlib import Path

TIMEOUT_S = 5.0


def main_command(proc: Path = Path("/proc/1/cmdline")) -> list[str]:
    """PID 1's argv with the interpreter of a script entry point dropped: `python /opt/venv/bin/dagster ...` reads
    as `dagster ...`."""
    argv = [arg for arg in proc.read_bytes().decode(errors="replace").split("\0") if arg]
    if len(argv) > 1 and Path(argv[0]).name.startswith("python") and not argv[1].startswith("-"):
        argv = argv[1:]
    return [Path(argv[0]).name, *argv[1:]] if argv else []


def option(argv: Sequence[str], flags: Sequence[str], default: str) -> str:
    for index, arg in enumerate(argv):
        if arg in flags and index + 1 < len(argv):
            return argv[index + 1]
        for flag in flags:
            if flag.startswith("--") and arg.startswith(f"{flag}="):
                return arg.split("=", 1)[1]
    return default


def address(argv: Sequence[str], default_port: str) -> str:
    host = option(argv, ("-h", "--host"), "127.0.0.1")
    if host in ("0.0.0.0", "::", ""):  # listening everywhere: loopback is one of them
        host = "127.0.0.1"
    return f"{host}:{option(argv, ('-p', '--port'), default_port)}"


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def grpc_serving(target: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(target) as channel:
            request = health_pb2.HealthCheckRequest(service="DagsterApi")
            reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=TIMEOUT_S)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def healthy(argv: Sequence[str]) -> bool:
    if not argv:
        return True
    program, args = argv[0], list(argv[1:])
    if program == "dagster-webserver":
        return http_ok(f"http://{address(args, '3000')}/server_info")
    if program == "dagster" and args[:2] in (["code-server", "start"], ["api", "grpc"]):
        return grpc_serving(address(args, "4000"))
    if program == "dagster-daemon" and args[:1] == ["run"]:
        daemon = Path(sys.executable).parent / "dagster-daemon"
        check = subprocess.run([str(daemon), "liveness-check"], capture_output=True, timeout=25, check=False)
        return check.returncode == 0
    if program == "mirus" and args[:1] == ["api"]:
        return http_ok(f"http://{address(args, '8083')}/")
    return True


if __name__ == "__main__":
    sys.exit(0 if healthy(main_command()) else 1)
