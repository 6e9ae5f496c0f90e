"""Contract test of `TinkerBackend` against the real `tinker` SDK, with only the network replaced.

The Tinker service cannot be reached from here, so the SDK's HTTP transport is swapped for an in-memory
server (`httpx.MockTransport`, as the SDK's own `rest_client_copy_weights_test.py` does). Everything above
the transport is the real SDK: ServiceClient, session setup, training/sampling clients, request futures,
pydantic validation and dtype coercion of `Datum`/`TensorData`/`AdamParams`/`SamplingParams`, and the
protobuf encoding of forward_backward. The fake server decodes what arrives on the wire, so the assertions
are about exactly what the service would receive.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from kbrl.training.backends.base import AdamParams
from kbrl.training.backends.tinker_backend import MissingTinkerAPIKey, TinkerBackend, tinker_api_key
from kbrl.training.datums import build_datum

tinker = pytest.importorskip("tinker")
from tinker.lib import internal_client_holder  # noqa: E402
from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

BASE_MODEL = "Qwen/Qwen3-4B-Instruct-2507"
SESSION = "sess-test"
MODEL_ID = f"{SESSION}:train:0"
PROTO = "application/x-protobuf"


class FakeTinkerService:
    """The endpoints one training run touches, answering like the service; every request is recorded.

    Long-running calls answer with a future id; `/retrieve_future` then returns the stored result (JSON, or
    protobuf for the types the SDK only accepts as protobuf: ForwardBackwardOutput and SampleResponse).
    """

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self._results: dict[str, dict[str, Any] | bytes] = {}
        self._counter = 0

    def bodies(self, path: str) -> list[Any]:
        return [body for p, body in self.calls if p == path]

    def _future(self, result: dict[str, Any] | bytes, **extra: Any) -> httpx.Response:
        self._counter += 1
        request_id = f"req-{self._counter}"
        self._results[request_id] = result
        return httpx.Response(200, json={"request_id": request_id, **extra})

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/api/v1/forward_backward":
            assert request.headers["content-type"] == PROTO
            body: Any = pb.ForwardBackwardRequest.FromString(request.content)
        else:
            body = json.loads(request.content) if request.content else None
        self.calls.append((path, body))
        if path == "/api/v1/client/config":
            # API-key auth, plain httpx transport, uncompressed protobuf, per-request result polling.
            return httpx.Response(200, json={"pjwt_auth_enabled": False, "use_pyqwest_transport": False})
        if path == "/api/v1/client/dynamic_config":
            return httpx.Response(200, json={})
        if path == "/api/v1/create_session":
            return httpx.Response(200, json={"session_id": SESSION})
        if path == "/api/v1/session_heartbeat":
            return httpx.Response(200, json={"type": "session_heartbeat"})
        if path == "/api/v1/create_model":
            return self._future({"model_id": MODEL_ID, "type": "create_model"}, model_id=MODEL_ID)
        if path == "/api/v1/load_weights":
            return self._future({"path": body["path"], "model_id": MODEL_ID, "type": "load_weights"})
        if path == "/api/v1/get_info":
            return httpx.Response(
                200,
                json={
                    "model_id": body["model_id"],
                    "model_data": {"model_name": BASE_MODEL, "arch": "qwen3", "tokenizer_id": BASE_MODEL},
                    "is_lora": True,
                    "lora_rank": 8,
                },
            )
        if path == "/api/v1/forward_backward":
            return self._future(self._forward_backward_output(body))
        if path == "/api/v1/optim_step":
            return self._future({"metrics": {"optim/grad_norm": 0.5}})
        if path == "/api/v1/save_weights":
            return self._future(
                {"path": f"tinker://{MODEL_ID}/weights/{body['path']}", "type": "save_weights"}
            )
        if path == "/api/v1/save_weights_for_sampler":
            return self._future(
                {"sampling_session_id": f"sampler-{self._counter}", "type": "save_weights_for_sampler"}
            )
        if path == "/api/v1/asample":
            n = body["num_samples"]
            return self._future(self._sample_response(n), sample_sequence_ids=[f"seq-{i}" for i in range(n)])
        if path == "/api/v1/retrieve_future":
            result = self._results[body["request_id"]]
            if isinstance(result, bytes):
                return httpx.Response(200, content=result, headers={"content-type": PROTO})
            return httpx.Response(200, json=result)
        if path == f"/api/v1/sessions/{SESSION}/finish":
            return httpx.Response(200)
        return httpx.Response(404, json={"detail": f"fake service has no {path}"})

    @staticmethod
    def _forward_backward_output(request: Any) -> bytes:
        """Loss metrics plus per-datum learner logprobs equal to the sampling ones (an on-policy step)."""
        chunks = [np.frombuffer(d.loss_fn_inputs["logprobs"].dense, dtype=np.float32) for d in request.data]
        offsets = np.cumsum([0] + [c.nbytes for c in chunks]).astype(np.int64)
        record = pb.ArrayRecord(num_datums=len(chunks))
        field = record.fields["logprobs"]
        field.dtype = pb.DTYPE_FLOAT32
        field.data = b"".join(c.tobytes() for c in chunks)
        field.offsets = offsets.tobytes()
        output = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", metrics={"loss:sum": -1.5})
        output.loss_fn_outputs.append(record)
        return output.SerializeToString()

    @staticmethod
    def _sample_response(n: int) -> bytes:
        response = pb.SampleResponse()
        for i in range(n):
            seq = response.sequences.add()
            seq.tokens = np.array([40 + i, 41, 42], dtype=np.int32).tobytes()
            seq.logprobs = np.array([-0.5, -1.0, -0.25], dtype=np.float32).tobytes()
            seq.stop_reason = pb.STOP_REASON_STOP if i % 2 == 0 else pb.STOP_REASON_LENGTH
        return response.SerializeToString()


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeTinkerService:
    """Route every HTTP request the SDK makes to a fresh fake service; nothing else is patched."""
    fake = FakeTinkerService()
    real_client = internal_client_holder.AsyncTinker

    def client_over_fake_transport(**kwargs: Any) -> Any:
        return real_client(
            **kwargs, http_client=httpx.AsyncClient(transport=httpx.MockTransport(fake.handle))
        )

    monkeypatch.setattr(internal_client_holder, "AsyncTinker", client_over_fake_transport)
    monkeypatch.setenv("TINKER_API_KEY", "tml-test-key")
    monkeypatch.setenv("TINKER_BASE_URL", "https://tinker.invalid")
    monkeypatch.setenv("TINKER_TELEMETRY", "0")
    monkeypatch.chdir(tmp_path)  # no stray ./.env
    return fake


@pytest.fixture
def backend(service: FakeTinkerService, tiny_tokenizer: Any) -> Any:
    b = TinkerBackend(BASE_MODEL, lora_rank=8, seed=3, tokenizer=tiny_tokenizer)
    yield b
    b.close()


def test_session_and_lora_client_creation(backend: TinkerBackend, service: FakeTinkerService) -> None:
    create = service.bodies("/api/v1/create_model")
    assert len(create) == 1
    assert create[0]["base_model"] == BASE_MODEL
    assert create[0]["session_id"] == SESSION
    assert create[0]["lora_config"] == {
        "rank": 8,
        "seed": 3,
        "train_mlp": True,
        "train_attn": True,
        "train_unembed": True,
    }


def test_forward_backward_sends_importance_sampling_datums(
    backend: TinkerBackend, service: FakeTinkerService
) -> None:
    prompt = [5, 6, 7, 8]
    datums = [
        build_datum(prompt, [20, 21, 22], [-0.5, -1.25, -2.0], advantage=0.75),
        build_datum(prompt[:2], [30, 31], [-0.1, -0.2], advantage=-0.25),
    ]
    metrics = backend.forward_backward(datums)

    (request,) = service.bodies("/api/v1/forward_backward")
    assert request.loss_fn == "importance_sampling"
    assert request.model_id == MODEL_ID
    assert len(request.data) == 2
    for sent, datum in zip(request.data, datums, strict=True):
        assert set(sent.loss_fn_inputs) == {"target_tokens", "logprobs", "advantages"}
        tensors = sent.loss_fn_inputs
        assert tensors["target_tokens"].dtype == pb.DTYPE_INT64
        assert tensors["logprobs"].dtype == pb.DTYPE_FLOAT32
        assert tensors["advantages"].dtype == pb.DTYPE_FLOAT32
        targets = np.frombuffer(tensors["target_tokens"].dense, dtype=np.int64)
        logprobs = np.frombuffer(tensors["logprobs"].dense, dtype=np.float32)
        advantages = np.frombuffer(tensors["advantages"].dense, dtype=np.float32)
        model_input = np.concatenate(
            [np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32) for chunk in sent.model_input]
        )
        assert len(model_input) == len(targets) == len(logprobs) == len(advantages) == len(datum)
        assert list(tensors["target_tokens"].shape) == [len(datum)]
        assert model_input.tolist() == list(datum.model_input)
        assert targets.tolist() == list(datum.target_tokens)
        np.testing.assert_allclose(logprobs, datum.logprobs, rtol=1e-6)
        np.testing.assert_allclose(advantages, datum.advantages, rtol=1e-6)
    # Cookbook layout, as received: the first datum's prompt has 4 tokens, so 3 observation positions.
    first = request.data[0].loss_fn_inputs
    assert np.frombuffer(first["target_tokens"].dense, dtype=np.int64).tolist() == [0, 0, 0, 20, 21, 22]
    assert np.frombuffer(first["advantages"].dense, dtype=np.float32).tolist() == [0, 0, 0, 0.75, 0.75, 0.75]

    assert metrics["loss"] == metrics["loss:sum"] == -1.5
    assert metrics["n_datums"] == 2 and metrics["n_tokens"] == 5
    # The fake echoes the sampling logprobs as the learner's, so sampler and learner agree.
    assert metrics["kl_sample_train_v1"] == pytest.approx(0.0, abs=1e-7)


def test_optim_step_sends_adam_params(backend: TinkerBackend, service: FakeTinkerService) -> None:
    metrics = backend.optim_step(AdamParams(learning_rate=4e-5, beta1=0.85, eps=1e-8, weight_decay=0.01))

    (request,) = service.bodies("/api/v1/optim_step")
    assert request["model_id"] == MODEL_ID
    assert request["adam_params"] == {  # the wire name for AdamParams
        "learning_rate": 4e-5,
        "beta1": 0.85,
        "beta2": 0.95,
        "eps": 1e-8,
        "weight_decay": 0.01,
        "grad_clip_norm": 0.0,
    }
    assert metrics == {"optim/grad_norm": 0.5, "learning_rate": 4e-5}
    assert backend.policy_version == 1 and backend.sampler_version == 0


def test_sample_uses_fresh_sampler_and_sampling_params(
    backend: TinkerBackend, service: FakeTinkerService
) -> None:
    groups = backend.sample([[1, 2, 3], [4, 5]], n=2, max_tokens=16, temperature=0.7, stop=["```\n"])

    assert len(service.bodies("/api/v1/save_weights_for_sampler")) == 1  # sampler made from current weights
    requests = service.bodies("/api/v1/asample")
    assert [r["prompt"]["chunks"][0]["tokens"] for r in requests] == [[1, 2, 3], [4, 5]]
    for r in requests:
        assert r["num_samples"] == 2
        assert r["sampling_params"]["max_tokens"] == 16
        assert r["sampling_params"]["temperature"] == 0.7
        assert r["sampling_params"]["stop"] == ["```\n"]
    assert [len(g) for g in groups] == [2, 2]
    first = groups[0][0]
    assert first.tokens == (40, 41, 42)
    assert first.logprobs == pytest.approx((-0.5, -1.0, -0.25))
    assert first.text == backend.tokenizer.decode([40, 41, 42], skip_special_tokens=True)
    assert [s.stop_reason for s in groups[0]] == ["stop", "length"]

    backend.sample([[1, 2]], n=1, max_tokens=4)
    assert len(service.bodies("/api/v1/save_weights_for_sampler")) == 1  # reused until refreshed
    backend.refresh_sampler()
    assert len(service.bodies("/api/v1/save_weights_for_sampler")) == 2


def test_checkpoint_save_and_resume(backend: TinkerBackend, service: FakeTinkerService) -> None:
    path = backend.save_checkpoint("step-000010")
    assert path == f"tinker://{MODEL_ID}/weights/step-000010"
    assert service.bodies("/api/v1/save_weights")[0]["path"] == "step-000010"

    backend.load_checkpoint(path)
    (load,) = service.bodies("/api/v1/load_weights")
    assert load["path"] == path and load["optimizer"] is True  # weights and Adam state


def test_missing_api_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "placeholder")  # so that monkeypatch restores the original state
    monkeypatch.delenv("TINKER_API_KEY")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(MissingTinkerAPIKey, match="TINKER_API_KEY"):
        TinkerBackend(BASE_MODEL)


def test_api_key_is_read_from_dotenv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TINKER_API_KEY", "placeholder")  # so that monkeypatch restores the original state
    monkeypatch.delenv("TINKER_API_KEY")
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("TINKER_API_KEY=tml-from-dotenv\n")
    assert tinker_api_key() == "tml-from-dotenv"


def test_close_finishes_the_session(service: FakeTinkerService, tiny_tokenizer: Any) -> None:
    backend = TinkerBackend(BASE_MODEL, lora_rank=8, tokenizer=tiny_tokenizer)
    backend.close()
    (finish,) = service.bodies(f"/api/v1/sessions/{SESSION}/finish")
    assert finish["reason"] == {"type": "success"}
