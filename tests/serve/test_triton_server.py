"""A real tritonserver (the nvidia-pytriton wheel's CPU build) serves attnx's python-backend repositories:
through tritonclient over HTTP and gRPC, the encoder answers what ONNX Runtime computes, two interleaved
sequences of a decoder get attnx generate's tokens, bad requests get Triton's errors and the server stays
up, and a dead server fails a test with its log instead of hanging."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import attnx
from tests.serve.tritonserver import ServerDied, TritonServer, running

pytest.importorskip("tritonclient.http")
pytestmark = pytest.mark.timeout(1800)  # the first run fetches the server wheel and builds the environment
TIMEOUT = 60  # seconds, for every request


class Client:
    """One protocol's client for ``server``: ``infer`` returns the named outputs as numpy arrays or raises
    InferenceServerException; a request that fails because the server died fails with its log."""

    def __init__(self, server: TritonServer, protocol: str) -> None:
        self.server, self.protocol = server, protocol
        if protocol == "http":
            import tritonclient.http as module

            self.client = module.InferenceServerClient(
                server.http_url, connection_timeout=TIMEOUT, network_timeout=TIMEOUT
            )
        else:
            import tritonclient.grpc as module

            self.client = module.InferenceServerClient(server.grpc_url)
        self.module = module

    def infer(self, model: str, inputs: dict[str, np.ndarray], outputs: list[str], **sequence) -> list:
        from tritonclient.utils import np_to_triton_dtype

        tensors = []
        for name, array in inputs.items():
            tensors.append(self.module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)))
            tensors[-1].set_data_from_numpy(array)
        timeout = {} if self.protocol == "http" else {"client_timeout": TIMEOUT}  # http: the client's own
        result = self.server.call(lambda: self.client.infer(model, tensors, **sequence, **timeout))
        return [result.as_numpy(name) for name in outputs]

    def step(self, model: str, ids: list[int], sequence_id, start=False, end=False) -> np.ndarray:
        """The logits (1, len(ids), vocab) of one request of a sequence."""
        feed = {"input_ids": np.asarray([ids], dtype=np.int64)}
        flags = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
        return self.infer(model, feed, ["logits"], **flags)[0]

    def close(self) -> None:
        self.client.close()


@pytest.fixture(params=["http", "grpc"])
def client(request, triton_server):
    made = Client(triton_server, request.param)
    yield made
    made.close()


def test_the_server_loads_every_model_of_one_repository_as_written(triton_server, python_repositories):
    """tritonserver started with nothing but the repositories, the wheel's backends and ports (no
    environment variables at all) has every model ready, with attnx's config."""
    from tritonclient.grpc import InferenceServerClient

    client = InferenceServerClient(triton_server.grpc_url)
    try:
        for name in python_repositories:
            assert client.is_model_ready(name), name
            config = client.get_model_config(name, client_timeout=TIMEOUT).config
            assert config.backend == "python" and "EXECUTION_ENV_PATH" in config.parameters
        assert client.get_model_config("kv").config.sequence_batching.oldest.max_candidate_sequences == 16
    finally:
        client.close()
    assert [a.split("=")[0] for a in triton_server.command[1:]] == [
        "--model-repository",  # one repository holds the three models
        "--backend-directory",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--exit-timeout-secs",
    ]


def test_the_encoder_answers_what_onnxruntime_computes(client, encoder_export):
    session = ort.InferenceSession(str(encoder_export / "model.onnx"))
    rng = np.random.default_rng(11)
    for batch, length in ((2, 7), (1, 33), (3, 1)):
        mask = np.ones((batch, length), dtype=bool)
        mask[0, (length + 1) // 2 :] = False
        feed = {"input_ids": rng.integers(0, 50, size=(batch, length)), "attention_mask": mask}
        served = client.infer("encoder", feed, ["hidden_states", "logits"])
        for got, expected in zip(served, session.run(["hidden_states", "logits"], feed), strict=True):
            np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("model, variant", [("kv", "softmax"), ("rnn", "linear")])
def test_two_interleaved_sequences_get_attnx_generates_tokens(client, serve_export, model, variant):
    prompts = {101: [3, 9, 4, 12, 5, 6, 2], 202: [4]}
    got = {key: [] for key in prompts}
    for step in range(8):
        for key in prompts if step % 2 else reversed(list(prompts)):
            ids = prompts[key] if step == 0 else [got[key][-1]]
            logits = client.step(model, ids, key, start=step == 0, end=step == 7)
            got[key].append(int(logits[0, -1].argmax()))
    for key, prompt in prompts.items():
        assert got[key] == attnx.generate(serve_export(variant), prompt, 8).tokens, key


def test_interleaved_forced_tokens_follow_the_full_forward(client, serve_export):
    """Two sequences fed the same random tokens at different offsets: each one's logits at every
    position are model.onnx's full forward of its own tokens (a state carried wrongly fails)."""
    out = serve_export("softmax")
    ids = np.random.default_rng(12).integers(0, 50, size=(2, 10))
    full = ort.InferenceSession(str(out / "model.onnx"))
    logits = {
        "x": [client.step("kv", ids[0, :3].tolist(), "x", start=True)[0]],
        "y": [client.step("kv", ids[1, :1].tolist(), "y", start=True)[0]],
    }
    for position in range(3, 10):
        last = position == 9
        logits["x"].append(client.step("kv", [int(ids[0, position])], "x", end=last)[0])
        logits["y"].append(client.step("kv", [int(ids[1, position - 2])], "y", end=last)[0])
    for key, row in (("x", 0), ("y", 1)):
        served = np.concatenate(logits[key])
        expected = full.run(["logits"], {"input_ids": ids[row : row + 1, : len(served)]})[0][0]
        np.testing.assert_allclose(served, expected, atol=2e-5, rtol=1e-4)


def test_bad_requests_get_tritons_errors_and_the_server_stays_up(client, triton_server):
    from tritonclient.utils import InferenceServerException

    ids = np.zeros((1, 4), dtype=np.int64)
    start, start_end = {"sequence_start": True}, {"sequence_start": True, "sequence_end": True}
    bad = [  # model, inputs, sequence flags, the error
        ("encoder", {"input_ids": ids[None], "attention_mask": ids[None] == 0}, {}, "unexpected shape"),
        ("encoder", {"input_ids": ids.astype(np.float32), "attention_mask": ids == 0}, {}, "(?i)data.?type"),
        ("kv", {"input_ids": ids}, {"sequence_id": 999}, "must specify the START flag"),
        ("kv", {"input_ids": ids + 50}, {"sequence_id": 5, **start_end}, "ids outside 0..49"),
        ("kv", {"input_ids": np.zeros((2, 3), np.int64)}, {"sequence_id": 6, **start}, "unexpected shape"),
    ]
    for model, feed, sequence, fragment in bad:
        with pytest.raises(InferenceServerException, match=fragment):
            client.infer(model, feed, ["logits"], **sequence)
        assert triton_server.alive()
    client.step("kv", [1, 2], 7, start=True, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.step("kv", [3], 7)  # the sequence ended
    assert client.step("kv", [3], 7, start=True, end=True).shape == (1, 1, 50)


def repository(root, config: str):
    """A repository of one model "broken" with ``config`` and no model.py."""
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "config.pbtxt").write_text(config)
    return root


def test_a_server_that_exits_fails_with_its_log(triton_build, tmp_path):
    repo = repository(tmp_path / "repo", 'backend: "no-such-backend"\nmax_batch_size: 0\n')
    server = TritonServer(triton_build, [repo], tmp_path / "server.log")
    with pytest.raises(ServerDied, match="(?s)tritonserver exited with code 1; its log:.*no-such-backend"):
        server.start()


def test_a_server_that_never_gets_ready_fails_with_its_log_in_bounded_time(triton_build, tmp_path):
    repo = repository(tmp_path / "repo", 'backend: "python"\nmax_batch_size: 0\n')  # its stub cannot start
    server = TritonServer(triton_build, [repo], tmp_path / "server.log")
    with pytest.raises(ServerDied, match="(?s)not ready after 3 s; its log:.*model.py"):
        server.start(timeout=3)
    assert not server.alive()  # stopped


def test_a_dead_server_fails_the_request_with_its_log(triton_build, tmp_path):
    (tmp_path / "empty").mkdir()
    with running(triton_build, [tmp_path / "empty"], tmp_path / "server.log") as server:
        client = Client(server, "http")
        server.process.kill()
        server.process.wait(30)
        with pytest.raises(ServerDied, match="(?s)tritonserver exited with code -9; its log:.*Started"):
            client.infer("anything", {"x": np.zeros(1, np.float32)}, ["y"])
        client.close()
