// Greedy generation by transformers.js in Node.js, for tests/serve/test_transformers_js.py.
// node transformers_js_generate.cjs MODEL_DIR IDS(comma-separated) NEW_TOKENS
// prints the new token ids as JSON; transformers.js is resolved from $ATTNX_TRANSFORMERS_JS
// (a directory where `npm install @huggingface/transformers` ran).
const { createRequire } = require("node:module");
const path = require("node:path");

async function main() {
  const [dir, idsText, steps] = process.argv.slice(2);
  const load = createRequire(path.join(process.env.ATTNX_TRANSFORMERS_JS, "package.json"));
  const { AutoModelForCausalLM, Tensor, env } = load("@huggingface/transformers");
  env.allowRemoteModels = false;
  env.localModelPath = "/";
  const model = await AutoModelForCausalLM.from_pretrained(path.resolve(dir), {
    subfolder: "",
    model_file_name: "transformers-js",
    dtype: "fp32",
    local_files_only: true,
  });
  const ids = idsText.split(",").map(BigInt);
  const input_ids = new Tensor("int64", BigInt64Array.from(ids), [1, ids.length]);
  const attention_mask = new Tensor("int64", BigInt64Array.from(ids.map(() => 1n)), [1, ids.length]);
  const n = Number(steps);
  const out = await model.generate({ input_ids, attention_mask, max_new_tokens: n, min_new_tokens: n, do_sample: false });
  console.log(JSON.stringify(Array.from(out.data, Number).slice(ids.length)));
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
