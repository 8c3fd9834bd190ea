"""Drives raylet's OpenAI-compatible server with the official `openai`
client; llm/tests/openai_client.rs runs it and checks what it prints (one
JSON object).

    python openai_client.py SCENARIO BASE_URL API_KEY MODEL

Scenarios:
  basic       a completion and a chat, whole and streamed (greedy, so the
              streamed text must equal the whole one), the models list
  concurrent  32 streams at once, each of 16 tokens
  disconnect  reads two events of a long stream, then closes it
  bad         a prompt longer than the context, an unknown model, a wrong
              API key: the client's exception and status for each
"""

import asyncio
import json
import sys

import openai

PROMPT = "def add(a, b):\n"


def basic(client, model):
    whole = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=16, temperature=0, extra_body={"ignore_eos": True}
    )
    stream = client.completions.create(
        model=model,
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    streamed, usage, finish = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        for choice in chunk.choices:
            streamed.append(choice.text)
            finish = choice.finish_reason or finish
    messages = [{"role": "system", "content": "Write Python."}, {"role": "user", "content": "a sum"}]
    chat = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
    chat_stream = client.chat.completions.create(
        model=model, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    chat_streamed = "".join(
        chunk.choices[0].delta.content or "" for chunk in chat_stream if chunk.choices
    )
    sampled = [
        client.completions.create(
            model=model, prompt=PROMPT, max_tokens=12, temperature=1.0, top_p=0.9, seed=seed,
            extra_body={"ignore_eos": True},
        ).choices[0].text
        for seed in (7, 7, 8)
    ]
    return {
        "models": [m.id for m in client.models.list().data],
        "whole_text": whole.choices[0].text,
        "whole_finish": whole.choices[0].finish_reason,
        "whole_usage": whole.usage.completion_tokens,
        "streamed_text": "".join(streamed),
        "streamed_chunks": len(streamed),
        "streamed_finish": finish,
        "streamed_usage": usage,
        "chat_role": chat.choices[0].message.role,
        "chat_text": chat.choices[0].message.content,
        "chat_streamed_text": chat_streamed,
        "sampled": sampled,
    }


async def one_stream(client, model, index):
    stream = await client.completions.create(
        model=model,
        prompt=f"x{index} = ",
        max_tokens=16,
        temperature=0.8,
        seed=index,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    usage = None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
    return usage


async def concurrent(base_url, key, model):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    usages = await asyncio.gather(*(one_stream(client, model, i) for i in range(32)))
    await client.close()
    return {"usages": usages}


def disconnect(client, model):
    stream = client.completions.create(
        model=model, prompt=PROMPT, max_tokens=1000, temperature=0, stream=True,
        extra_body={"ignore_eos": True},
    )
    read = 0
    for _ in stream:
        read += 1
        if read == 2:
            break
    stream.close()
    return {"read": read}


def bad(client, model, base_url):
    outcomes = {}
    attempts = {
        "too_long": lambda c: c.completions.create(model=model, prompt="x = 1\n" * 2000, max_tokens=4),
        "unknown_model": lambda c: c.completions.create(model="gpt-4", prompt="x", max_tokens=4),
        "zero_tokens": lambda c: c.completions.create(model=model, prompt="x", max_tokens=0),
        "wrong_key": lambda c: openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0)
        .completions.create(model=model, prompt="x", max_tokens=4),
    }
    for name, attempt in attempts.items():
        try:
            attempt(client)
            outcomes[name] = {"status": 200}
        except openai.APIStatusError as error:
            body = error.body if isinstance(error.body, dict) else {}
            body = body.get("error", body) if isinstance(body.get("error"), dict) else body
            outcomes[name] = {
                "status": error.status_code,
                "class": type(error).__name__,
                "message": body.get("message") or str(error),
                "code": body.get("code"),
            }
    return outcomes


def main():
    scenario, base_url, key, model = sys.argv[1:5]
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=120)
    if scenario == "basic":
        result = basic(client, model)
    elif scenario == "concurrent":
        result = asyncio.run(concurrent(base_url, key, model))
    elif scenario == "disconnect":
        result = disconnect(client, model)
    elif scenario == "bad":
        result = bad(client, model, base_url)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
