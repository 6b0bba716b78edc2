"""The served model for the server tests: a real uvicorn server on a free loopback port."""
import json
import socket
import threading
import time

import pytest

from helpers.models import CHATML
from helpers.server import KEY
from sonarspec_ext import LLM, SpecConfig
from sonarspec_ext.server.app import ServerLimits, create_app


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The packaged target (its MTP head drafts) with a ChatML template, behind uvicorn."""
    import shutil
    import uvicorn
    from sonarspec_ext.assets import resolve
    model = str(tmp_path_factory.mktemp("served") / "target")
    shutil.copytree(resolve("default", "target"), model)
    with open(f"{model}/tokenizer_config.json") as fh:
        cfg = json.load(fh)
    with open(f"{model}/tokenizer_config.json", "w") as fh:
        json.dump({**cfg, "chat_template": CHATML}, fh)
    spec = SpecConfig(method="mtp", draft=resolve("default", "mtp"), num_draft_tokens=2)
    llm = LLM(model, spec=spec)
    app = create_app(llm, "tiny", api_key=KEY, limits=ServerLimits(max_body_bytes=20_000, max_prompt_tokens=300,
                                                                    max_tokens=1000))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    oracle = LLM(model, spec=spec)
    yield f"http://127.0.0.1:{port}", app, llm, oracle
    srv.should_exit = True
    th.join(timeout=10)
