// Tabs (#chat, #cache), the key button, and the model name.
import { apiJson, askForKey } from "./api.js";
import { initChat, setImageInput } from "./chat.js";
import { initCache, setCacheVisible } from "./cache.js";

function show() {
  const page = location.hash === "#cache" ? "cache" : "chat";
  for (const name of ["chat", "cache"]) {
    document.getElementById(`page-${name}`).hidden = name !== page;
    document.getElementById(`tab-${name}`).classList.toggle("active", name === page);
  }
  setCacheVisible(page === "cache" && !document.hidden);
}

async function loadModel() {
  try {
    const models = await apiJson("/v1/models");
    const model = models.data[0];
    document.getElementById("model-name").textContent = `${model.id} · ctx ${model.max_model_len}`;
    window.kvserveModel = model.id;
    setImageInput(Boolean(model.modalities?.vision));
  } catch (error) {
    document.getElementById("model-name").textContent = `(${error.message})`;
  }
}

document.getElementById("key-button").addEventListener("click", async () => {
  if (await askForKey()) loadModel();
});
window.addEventListener("hashchange", show);
document.addEventListener("visibilitychange", show);
initChat();
initCache();
show();
loadModel();
