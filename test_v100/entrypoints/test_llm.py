"""The offline LLM API: tiny model with a real tokenizer, plus the default model."""
from __future__ import annotations

import pytest

from test_v100.worker.tiny_models import random_prompts, save_tiny_model
from vllm_volta import LLM, RequestOutput, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("llm_model")
    save_tiny_model(path, "llama", with_tokenizer=True)
    return LLM(str(path), cpu_kvcache_space=0.01, max_model_len=64)


def texts(outputs):
    return [o.outputs[0].text for o in outputs]


def test_prompt_forms_and_input_order(llm):
    tok = llm.get_tokenizer()
    ids = tok.encode("Hello world")
    outs = llm.generate(["The capital", "Hello world", ids, {"prompt_token_ids": ids},
                         {"prompt": "Hello world"}], GREEDY, use_tqdm=False)
    assert all(isinstance(o, RequestOutput) and o.finished for o in outs)
    assert outs[0].prompt == "The capital" and outs[2].prompt is None
    assert outs[1].prompt_token_ids == ids == outs[2].prompt_token_ids
    same = [list(o.outputs[0].token_ids) for o in outs[1:]]
    assert same == [same[0]] * 4
    for out in outs:
        comp = out.outputs[0]
        assert len(comp.token_ids) == 10 and comp.finish_reason == "length"
        assert comp.text == tok.decode(comp.token_ids, skip_special_tokens=True)
    single = llm.generate("Hello world", GREEDY, use_tqdm=False)
    assert len(single) == 1 and list(single[0].outputs[0].token_ids) == same[0]
    assert llm.generate(ids, GREEDY, use_tqdm=True)[0].prompt_token_ids == ids


def test_per_prompt_sampling_params(llm):
    outs = llm.generate(["a", "b"], [SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
                                     SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)],
                        use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outs] == [2, 5]
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [GREEDY], use_tqdm=False)


def test_too_long_prompt_fails_alone(llm):
    prompts = [random_prompts(1, 65, 65)[0], "Hello world", random_prompts(1, 100, 100)[0]]
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for bad in (outs[0], outs[2]):
        assert bad.finished and "exceeds max_model_len 64" in bad.error
        assert bad.outputs[0].finish_reason == "error" and not bad.outputs[0].token_ids
    assert outs[0].prompt_token_ids == prompts[0]
    assert outs[1].error is None and len(outs[1].outputs[0].token_ids) == 10
    assert not llm.llm_engine.has_unfinished_requests()


def test_stop_strings(llm):
    full = llm.generate("Hello world", SamplingParams(temperature=0, max_tokens=12,
                                                      ignore_eos=True), use_tqdm=False)
    text = full[0].outputs[0].text
    stop = text[3:6]
    assert stop.strip(), f"greedy text too short to pick a stop string: {text!r}"
    cut = text[:text.index(stop)]
    out = llm.generate("Hello world", SamplingParams(temperature=0, max_tokens=12, stop=stop,
                                                     ignore_eos=True), use_tqdm=False)[0]
    comp = out.outputs[0]
    assert (comp.text, comp.finish_reason, comp.stop_reason) == (cut, "stop", stop)
    kept = llm.generate("Hello world", SamplingParams(
        temperature=0, max_tokens=12, stop=[stop], include_stop_str_in_output=True,
        ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert kept.text == cut + stop


def test_chat_single_and_batch(llm):
    tok = llm.get_tokenizer()
    conv = [{"role": "user", "content": "Hello world"}]
    single = llm.chat(conv, GREEDY, use_tqdm=False)
    expected_ids = tok.encode("<|im_start|>user\nHello world<|im_end|>\n<|im_start|>assistant\n",
                              add_special_tokens=False)
    assert single[0].prompt_token_ids == expected_ids
    direct = llm.generate(expected_ids, GREEDY, use_tqdm=False)
    assert single[0].outputs[0].token_ids == direct[0].outputs[0].token_ids
    batch = llm.chat([conv, [{"role": "user", "content": "The capital"}]], GREEDY,
                     use_tqdm=False)
    assert len(batch) == 2 and batch[0].outputs[0].token_ids == direct[0].outputs[0].token_ids
    no_prompt = llm.chat(conv, GREEDY, use_tqdm=False, add_generation_prompt=False)
    assert len(no_prompt[0].prompt_token_ids) < len(expected_ids)


def test_chat_tools_and_template_kwargs(llm):
    """tools and chat_template_kwargs (Qwen3's enable_thinking, say) reach the template."""
    tok = llm.get_tokenizer()
    template = ("{% if tools %}T:{{ tools[0].function.name }};{% endif %}"
                "{% if enable_thinking is defined and not enable_thinking %}NT;{% endif %}"
                "{% for m in messages %}{{ m.content }}{% endfor %}")
    tools = [{"type": "function", "function": {"name": "lookup"}}]
    out = llm.chat([{"role": "user", "content": "hi"}], GREEDY, use_tqdm=False, chat_template=template,
                   tools=tools, chat_template_kwargs={"enable_thinking": False},
                   add_generation_prompt=False)
    assert out[0].prompt_token_ids == tok.encode("T:lookup;NT;hi", add_special_tokens=False)


def test_n_and_logprobs_through_llm(llm):
    out = llm.generate("Hello", SamplingParams(n=2, temperature=0.9, seed=3, max_tokens=6,
                                               logprobs=2, ignore_eos=True), use_tqdm=False)[0]
    assert [c.index for c in out.outputs] == [0, 1]
    for comp in out.outputs:
        assert len(comp.logprobs) == 6 and comp.cumulative_logprob < 0
        assert all(comp.token_ids[i] in comp.logprobs[i] for i in range(6))


def test_constructor_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown LLM argument"):
        LLM(str(tmp_path), not_an_option=1)
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        LLM(str(tmp_path), pipeline_parallel_size=0)


@pytest.fixture(scope="module")
def default_llm(default_model_path):
    return LLM(max_model_len=512, cpu_kvcache_space=0.05)


@pytest.fixture(scope="module")
def default_hf(default_model_path):
    """transformers' Llama holding the default model's (dequantized) weights, fp32."""
    import transformers

    from vllm_volta.model_executor.model_loader.gguf_config import load_gguf_config
    from vllm_volta.model_executor.model_loader.gguf_loader import iterate_gguf_weights
    model = transformers.LlamaForCausalLM(load_gguf_config(default_model_path)).eval()
    weights = dict(iterate_gguf_weights(default_model_path, use_tqdm=False))
    model.load_state_dict(weights, strict=False)
    model.tie_weights()
    return model


def test_default_model_answers(default_llm, default_hf):
    """DESIGN section 5: LLM() serves SmolLM2-135M-Instruct and answers correctly, with
    transformers' greedy tokens on the same weights."""
    from test_v100.worker.tiny_models import hf_greedy
    greedy = SamplingParams(temperature=0, max_tokens=24)
    out = default_llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                           greedy, use_tqdm=False)[0]
    chat = out.outputs[0]
    assert chat.text == "The capital of France is Paris."
    assert chat.finish_reason == "stop"
    # The engine stopped at eos (<|im_end|>, kept in token_ids); transformers, told to
    # ignore eos, produces the same tokens up to and including it.
    reference = hf_greedy(default_hf, out.prompt_token_ids, len(chat.token_ids))
    assert list(chat.token_ids) == reference
    completion = default_llm.generate("The capital of France is",
                                      SamplingParams(temperature=0, max_tokens=3),
                                      use_tqdm=False)[0].outputs[0]
    assert completion.text.startswith(" Paris.")
    engine = default_llm.llm_engine
    assert engine.model_config.served_model_name == "SmolLM2-135M-Instruct"


def test_package_exports():
    import vllm_volta
    from vllm_volta.engine.arg_utils import EngineArgs
    from vllm_volta.engine.llm_engine import LLMEngine
    from vllm_volta.outputs import CompletionOutput

    assert vllm_volta.EngineArgs is EngineArgs and vllm_volta.LLMEngine is LLMEngine
    assert vllm_volta.CompletionOutput is CompletionOutput and vllm_volta.LLM is LLM
    assert set(vllm_volta.__all__) >= {"LLM", "SamplingParams", "RequestOutput",
                                       "CompletionOutput", "EngineArgs", "LLMEngine"}
    assert isinstance(vllm_volta.__version__, str)
    with pytest.raises(AttributeError):
        vllm_volta.NotAThing  # noqa: B018


def test_generation_config_sampling_defaults(tmp_path):
    """generate() without sampling_params follows the model's generation_config.json (here:
    greedy, 5 tokens), as vLLM's --generation-config auto does; "vllm" keeps vLLM's defaults."""
    import json

    from test_v100.worker.tiny_models import hf_greedy

    hf = save_tiny_model(tmp_path, "llama")
    config = json.loads((tmp_path / "generation_config.json").read_text())
    config.update(temperature=0.0, top_p=0.9, max_new_tokens=5, do_sample=False)
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    prompt = random_prompts(1, 8, 8, seed=3)[0]
    llm = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.max_tokens) == (0.0, 5)
    out = llm.generate([prompt], use_tqdm=False)[0].outputs[0]
    assert list(out.token_ids) == hf_greedy(hf, prompt, 5)[:len(out.token_ids)]
    assert len(out.token_ids) == 5 or out.finish_reason == "stop"
    plain = LLM(str(tmp_path), cpu_kvcache_space=0.01, max_model_len=64, skip_tokenizer_init=True,
                generation_config="vllm").get_default_sampling_params()
    assert (plain.temperature, plain.top_p, plain.max_tokens) == (1.0, 1.0, 16)

