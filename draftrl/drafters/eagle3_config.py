"""What an EAGLE-3 head is, read from and written to the two published ``config.json`` layouts.

**speculators** (what ``draftrl distill`` writes, vLLM's documented format; the
``Eagle3SpeculatorConfig`` of vllm-project/speculators): ``speculators_model_type: "eagle3"``,
the decoder layer in ``transformer_layer_config`` (``model_type: "llama"``), ``draft_vocab_size``,
``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids``, ``norm_before_residual``,
``speculators_config.verifier.name_or_path``.

**EAGLE / SpecForge** (SafeAILab/EAGLE, sgl-project/SpecForge, SGLang): a Llama ``config.json``
with ``architectures: ["LlamaForCausalLMEagle3"]``, ``num_hidden_layers: 1``, ``vocab_size`` (the
target's), ``draft_vocab_size``, optionally ``target_hidden_size`` and an ``eagle_config`` holding
``eagle_aux_hidden_state_layer_ids`` (as vLLM and SGLang read them).

Defaults when a key is absent (checked against each project's code, see docs/architecture.md):

| key | default | whose |
|---|---|---|
| auxiliary layers | (2, L // 2, L - 3) of the L-layer target the head is attached to | EAGLE-3, vLLM, SGLang |
| ``norm_before_residual`` | False: the hidden input enters the residual before ``hidden_norm`` | speculators' config, |
| | | EAGLE's and SpecForge's layer, vLLM's Llama layer |
| ``draft_vocab_size`` | ``vocab_size`` (the head scores the whole vocabulary; no ``d2t`` needed) | vLLM |
| ``target_hidden_size`` | the layer's ``hidden_size`` | all |
| ``norm_before_fc``, ``fc_norm``, ``norm_output`` | False (the EAGLE-3.1 variants vLLM implements) | vLLM |

vLLM 0.32's speculators reader alone departs from this: it reads an absent
``norm_before_residual`` as True. draftrl always writes the key, so its folders mean the same to both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from transformers import LlamaConfig

#: the ``architectures`` names of the EAGLE / SpecForge layout (vLLM's registry maps both to its Eagle-3 Llama)
EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
#: the two layouts, by the name ``Eagle3Head.save_pretrained`` takes
LAYOUTS = ("speculators", "eagle")
#: LlamaConfig keys that are about the file, not the layer
_NOT_LAYER = ("architectures", "model_type", "transformers_version", "_name_or_path")


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's (and vLLM's) default auxiliary layers: (2, n // 2, n - 3); (2, 15, 27) for 30 layers.

    :raises ValueError: below 7 layers they repeat a layer or go backwards ((2, 2, 1) for 4), which vLLM
        cannot serve (it takes each layer once, in increasing order)."""
    layers = (2, num_layers // 2, num_layers - 3)
    if not layers[0] < layers[1] < layers[2]:
        raise ValueError(f"a {num_layers}-layer target has no usable default auxiliary layers ({layers} is not "
                         "increasing); set them explicitly (eagle_aux_hidden_state_layer_ids, or aux_layers for "
                         "draftrl distill)")
    return layers


def check_aux_layers(layers: tuple[int, ...], num_layers: int | None = None) -> tuple[int, ...]:
    """``layers`` if they are strictly increasing (and below ``num_layers`` when given): the order in
    which vLLM concatenates the target's auxiliary states, each layer once."""
    layers = tuple(int(layer) for layer in layers)
    if not layers or any(b <= a for a, b in zip(layers, layers[1:])) or layers[0] < 0:
        raise ValueError(f"auxiliary layers {list(layers)} must be distinct, increasing and >= 0 (vLLM "
                         "concatenates the target's states in layer order, each once)")
    if num_layers is not None and layers[-1] >= num_layers:
        raise ValueError(f"auxiliary layers {list(layers)} must lie in 0..{num_layers - 1} (the target's layers)")
    return layers


@dataclass
class Eagle3Config:
    """What a head is: its Llama layer's shape and how it hangs off its target."""

    layer: LlamaConfig
    """the decoder layer (hidden size, heads, rope, vocab_size = the target's vocabulary)"""
    draft_vocab_size: int
    """tokens the head scores (a frequency-ranked subset of the target's vocabulary)"""
    target_hidden_size: int
    aux_layers: tuple[int, ...] | None
    """the target layers whose inputs feed ``fc`` (see :mod:`draftrl.drafters.eagle3`); None: the
    default of the target the head is attached to (:meth:`for_layers`)"""
    verifier: str = ""
    """the target's name or local path (``speculators_config.verifier.name_or_path``)"""
    norm_before_residual: bool = False
    """the hidden input is normed before it becomes the residual (draftrl's own heads: True)"""
    norm_before_fc: bool = False
    """an RMSNorm (``input_norm``) over the concatenated auxiliary states before ``fc``"""
    fc_norm: bool = False
    """one RMSNorm per auxiliary state (``fc_norm.i``) before ``fc``"""
    norm_output: bool = False
    """the next draft step reads the head's normed output, not its pre-norm output"""

    def __post_init__(self) -> None:
        if self.aux_layers is not None:
            self.aux_layers = check_aux_layers(self.aux_layers)
        if not 1 <= self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} must lie in 1..{self.vocab_size} (vocab_size)")

    @classmethod
    def for_target(cls, target_config, draft_vocab_size: int, aux_layers: tuple[int, ...] | None = None,
                   verifier: str = "", norm_before_residual: bool = True) -> Eagle3Config:
        """A head shaped like one of the target's layers (same width, heads and rope), as ``draftrl
        distill`` trains it (hidden input normed before the residual)."""
        layer = LlamaConfig(**{k: v for k, v in target_config.to_dict().items() if k not in _NOT_LAYER})
        layer.num_hidden_layers = 1
        layer.architectures = ["LlamaForCausalLM"]
        if not 1 <= draft_vocab_size <= target_config.vocab_size:
            raise ValueError(f"draft_vocab_size={draft_vocab_size} must lie in 1..{target_config.vocab_size}")
        num_layers = target_config.num_hidden_layers
        layers = check_aux_layers(aux_layers, num_layers) if aux_layers else default_aux_layers(num_layers)
        return cls(layer, draft_vocab_size, target_config.hidden_size, layers, verifier, norm_before_residual)

    @property
    def vocab_size(self) -> int:
        return self.layer.vocab_size

    @property
    def num_aux(self) -> int:
        """Auxiliary states ``fc`` reads (3 when the layers are left to the target, as vLLM assumes)."""
        return len(self.aux_layers) if self.aux_layers else 3

    def for_layers(self, num_layers: int) -> Eagle3Config:
        """This config attached to an ``num_layers``-layer target: the auxiliary layers resolved and checked."""
        return replace(self, aux_layers=check_aux_layers(self.aux_layers or default_aux_layers(num_layers), num_layers))

    def _flags(self) -> dict:
        """The optional variant keys, written only when on (every reader defaults them to False)."""
        return {k: True for k in ("norm_before_fc", "fc_norm", "norm_output") if getattr(self, k)}

    def to_speculators(self, speculative_tokens: int = 4) -> dict:
        """config.json of the speculators layout (what vLLM's ``eagle3`` method loads)."""
        layer = self.layer.to_dict()
        layer.update(model_type="llama", architectures=["LlamaForCausalLM"], num_hidden_layers=1)
        out = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.9.0",
            "transformer_layer_config": layer,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            "norm_before_residual": self.norm_before_residual,
            **self._flags(),
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens}],
                "verifier": {"name_or_path": self.verifier, "architectures": ["LlamaForCausalLM"]},
            },
        }
        if self.aux_layers:
            out["eagle_aux_hidden_state_layer_ids"] = list(self.aux_layers)
        return out

    def to_eagle(self) -> dict:
        """config.json of the EAGLE / SpecForge layout: the layer's Llama keys plus the head's."""
        out = self.layer.to_dict()
        out.update(architectures=[EAGLE_ARCHITECTURES[0]], model_type="llama", num_hidden_layers=1,
                   draft_vocab_size=self.draft_vocab_size, norm_before_residual=self.norm_before_residual,
                   **self._flags())
        rope = dict(out.get("rope_parameters") or {})
        if "rope_theta" in rope:  # the legacy keys too: what EAGLE's code and transformers 4 readers take
            out["rope_theta"] = rope.pop("rope_theta")
            if rope.get("rope_type", "default") != "default":
                out["rope_scaling"] = rope
        if self.target_hidden_size != self.layer.hidden_size:
            out["target_hidden_size"] = self.target_hidden_size
        if self.aux_layers:
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers),
                                   "use_aux_hidden_state": True}
        return out


#: what every refusal of a config suggests
FIX = ("point at a head folder in the speculators or the EAGLE / SpecForge layout (as draftrl distill, "
       "Eagle3Head.save_pretrained, speculators or SpecForge write them)")


def read_config(data: dict, where: str) -> Eagle3Config:
    """The head described by ``config.json``'s ``data`` in either layout (``where`` names the file
    in messages). :raises ValueError: one line naming what is wrong and the layouts accepted."""
    if not isinstance(data, dict):
        raise ValueError(f"{where} holds a {type(data).__name__}, not a JSON object; {FIX}")
    try:
        if "speculators_model_type" in data:
            return _from_speculators(data)
        if set(data.get("architectures") or ()) & set(EAGLE_ARCHITECTURES):
            return _from_eagle(data)
    except (KeyError, TypeError, ValueError) as err:
        reason = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
        raise ValueError(f"{where} is no EAGLE-3 head's config draftrl reads ({reason}); {FIX}") from None
    raise ValueError(f"{where} is in no EAGLE-3 layout (architectures {data.get('architectures')}, model_type "
                     f"{data.get('model_type')!r}): the speculators layout has speculators_model_type 'eagle3', the "
                     f"EAGLE / SpecForge one architectures {list(EAGLE_ARCHITECTURES[:1])}; {FIX}")


def vllm_pins(data: dict) -> dict:
    """The keys of a head's ``config.json`` ``data`` that vLLM 0.32 reads otherwise than draftrl, with
    draftrl's values (``{}`` when both read it alike): a speculators-layout head without
    ``norm_before_residual`` is False to speculators and draftrl, True to vLLM 0.32's speculators reader,
    so the same weights would draft other tokens there. The EAGLE / SpecForge layout means the same to both."""
    if not isinstance(data, dict) or "speculators_model_type" not in data or "norm_before_residual" in data:
        return {}
    return {"norm_before_residual": read_config(data, "config.json").norm_before_residual}


def _layer(data: dict) -> LlamaConfig:
    model_type = data.get("model_type", "llama")
    if model_type != "llama":
        raise ValueError(f"the head's layer is model_type {model_type!r}; draftrl runs Llama-layer heads")
    layer = LlamaConfig(**{k: v for k, v in data.items() if k not in _NOT_LAYER})
    if layer.num_hidden_layers != 1:
        raise ValueError(f"num_hidden_layers={layer.num_hidden_layers}; draftrl runs one-layer EAGLE-3 heads")
    return layer


def _flags(data: dict, norm_before_fc: bool | None = None) -> dict:
    flags = {"norm_before_residual": data.get("norm_before_residual", False),
             "norm_before_fc": data.get("norm_before_fc", False) if norm_before_fc is None else norm_before_fc,
             "fc_norm": data.get("fc_norm", False), "norm_output": data.get("norm_output", False)}
    for key, value in flags.items():
        if not isinstance(value, bool):
            raise ValueError(f"{key}={value!r} must be true or false")
    return flags


def _aux(value) -> tuple[int, ...] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(layer, int) for layer in value):
        raise ValueError(f"eagle_aux_hidden_state_layer_ids={value!r} must be a list of layer numbers")
    return tuple(value)


def _from_speculators(data: dict) -> Eagle3Config:
    if data["speculators_model_type"] != "eagle3":
        raise ValueError(f"speculators_model_type is {data['speculators_model_type']!r}, not 'eagle3'")
    layer_data = data.get("transformer_layer_config")
    if not isinstance(layer_data, dict):
        raise ValueError("the speculators layout needs transformer_layer_config (the head's Llama layer)")
    layer = _layer(layer_data)
    verifier = ((data.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path") or ""
    return Eagle3Config(layer, int(data.get("draft_vocab_size") or layer.vocab_size),
                        int(data.get("target_hidden_size") or layer.hidden_size),
                        _aux(data.get("eagle_aux_hidden_state_layer_ids")), str(verifier), **_flags(data))


def _from_eagle(data: dict) -> Eagle3Config:
    eagle = data.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ValueError(f"eagle_config={eagle!r} must be an object")
    if eagle.get("use_aux_hidden_state", True) is not True:
        raise ValueError("eagle_config.use_aux_hidden_state is false (an EAGLE-1/2 style head without fc); "
                         "draftrl runs EAGLE-3 heads")
    layer = _layer(data)
    aux = data.get("eagle_aux_hidden_state_layer_ids") or eagle.get("eagle_aux_hidden_state_layer_ids")
    norm_before_fc = eagle.get("norm_before_fc", data.get("norm_before_fc", False))
    return Eagle3Config(layer, int(data.get("draft_vocab_size") or layer.vocab_size),
                        int(data.get("target_hidden_size") or layer.hidden_size), _aux(aux), "",
                        **_flags(data, norm_before_fc))
