"""Demo servers of the harness (agent, model, resources), built on ``SimpleServer`` like any user server."""

from __future__ import annotations

from typing import Final

__all__ = ["ENTRYPOINTS"]

#: The global-config ``entrypoint`` of each demo role.
ENTRYPOINTS: Final = {
    "agent": "gym_obs.harness.servers.agent:AgentServer",
    "model": "gym_obs.harness.servers.model:ModelServer",
    "resources": "gym_obs.harness.servers.resources:ResourcesServer",
}
