"""Entry point of one launched process: ``python -m gym_obs.server._child (--head | SERVER_NAME)``.

The launcher passes the resolved global config through the environment (``GYM_OBS_GLOBAL_CONFIG``), so a
child never re-reads the YAML file and every process runs with exactly the config the launcher validated.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from gym_obs.telemetry import names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gym_obs.server._child")
    parser.add_argument("server_name", nargs="?")
    parser.add_argument("--head", action="store_true", help="run the head server")
    args = parser.parse_args(argv)

    from gym_obs.client import global_config_from_environment
    from gym_obs.server.uvicorn import ServerStartupError
    from gym_obs.telemetry.logging import configure_logging, get_logger
    from gym_obs.telemetry.redaction import scrub_text

    configure_logging()
    config = global_config_from_environment()
    if config is None:
        print(f"gym_obs: {names.ENV_GLOBAL_CONFIG} is not set; use `gym-obs serve`", file=sys.stderr)
        return 2
    try:
        if args.head:
            from gym_obs.server.head_server import HeadServer

            HeadServer(config).run_webserver()
            return 0
        name = args.server_name or os.environ.get(names.ENV_SERVER_NAME)
        if not name:
            parser.error("a server name is required")
        from gym_obs.server.base_server import load_server

        load_server(name, config).run_webserver()
    except ServerStartupError as error:
        print(f"gym_obs: {error}", file=sys.stderr)
        return 3
    except Exception as error:
        # Logged through the scrubbing pipeline, then one summary line: the last line of the log
        # is what the launcher's error shows first.
        get_logger("gym_obs.server").exception("server failed to start")
        summary = scrub_text(f"{type(error).__name__}: {error}")
        print(f"gym_obs: server failed to start: {summary}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
