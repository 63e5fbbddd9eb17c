"""Demo model server: ``POST /v1/responses`` with synthetic replies after a configurable latency.

No model runs; the latency distribution stands in for generation time so the harness can load the runtime
(pools, retries, spans) the way a real model server does without a GPU.
"""

from __future__ import annotations

import asyncio
import math
import random
import uuid
from typing import Any, ClassVar, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from gym_obs.harness.fault_middleware import raise_injected_fault
from gym_obs.harness.servers._common import HarnessServer, OwnConfig

__all__ = ["LatencySpec", "ModelServer", "ModelSettings"]

RESPONSES_ROUTE = "/v1/responses"


class LatencySpec(BaseModel):
    """Generation latency: ``median_s`` and a shape; every sample is clamped to ``[min_s, max_s]``."""

    model_config = ConfigDict(extra="forbid")

    distribution: Literal["constant", "uniform", "exponential", "lognormal"] = "lognormal"
    median_s: float = Field(default=0.01, ge=0.0, le=600.0)
    sigma: float = Field(default=0.5, ge=0.0, le=5.0, description="lognormal shape")
    min_s: float = Field(default=0.0, ge=0.0)
    max_s: float = Field(default=5.0, gt=0.0)

    def sample(self, rng: random.Random) -> float:
        if self.median_s <= 0:
            return 0.0
        if self.distribution == "constant":
            value = self.median_s
        elif self.distribution == "uniform":
            value = rng.uniform(0.0, 2 * self.median_s)
        elif self.distribution == "exponential":
            value = rng.expovariate(math.log(2) / self.median_s)
        else:
            value = rng.lognormvariate(math.log(self.median_s), self.sigma)
        return min(max(value, self.min_s), self.max_s)


class ModelSettings(OwnConfig):
    latency: LatencySpec = Field(default_factory=LatencySpec)
    reply_words: int = Field(default=12, ge=1, le=10_000)


class ModelServer(HarnessServer):
    """Answers like a Responses API model: one assistant message, usage counts, after ``latency``."""

    role: ClassVar = "model"
    sessions_enabled: ClassVar = False  # stateless: no session token per request
    settings_model: ClassVar = ModelSettings
    hooked_routes: ClassVar = frozenset({RESPONSES_ROUTE})

    def setup_webserver(self) -> FastAPI:
        settings = self.settings
        assert isinstance(settings, ModelSettings)
        rng = random.Random(settings.seed)
        app = self.new_app()

        @app.post(RESPONSES_ROUTE)
        async def responses(request: Request) -> dict[str, Any]:
            body = await request.json()
            await asyncio.sleep(settings.latency.sample(rng))
            raise_injected_fault()  # where a real model server's generation would fail
            turn = body.get("metadata", {}).get("turn", 0) if isinstance(body, dict) else 0
            words = " ".join(f"token{(turn + i) % 97}" for i in range(settings.reply_words))
            return {
                "id": f"resp_{uuid.uuid4().hex}",
                "object": "response",
                "model": self.server_name,
                "status": "completed",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": f"answer {turn}: {words}"}],
                    }
                ],
                "usage": {"input_tokens": len(str(body)) // 4, "output_tokens": settings.reply_words},
            }

        return app
