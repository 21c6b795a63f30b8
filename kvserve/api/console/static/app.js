// Tabs (#chat, #cache, and #cluster behind `kvserve cluster`), the key button, and the model name.
import { apiJson, askForKey } from "./api.js";
import { initChat, setImageInput } from "./chat.js";
import { initCache, setCacheVisible } from "./cache.js";
import { hasCluster, initCluster, setClusterVisible } from "./cluster.js";

let pages = ["chat", "cache"];

function show() {
  const wanted = location.hash.slice(1);
  const page = pages.includes(wanted) ? wanted : "chat";
  for (const name of ["chat", "cache", "cluster"]) {
    document.getElementById(`page-${name}`).hidden = name !== page;
    document.getElementById(`tab-${name}`).classList.toggle("active", name === page);
  }
  setCacheVisible(page === "cache" && !document.hidden);
  setClusterVisible(page === "cluster" && !document.hidden);
}

async function findCluster() {
  if (!(await hasCluster())) return;
  pages = [...pages, "cluster"];
  document.getElementById("tab-cluster").hidden = false;
  show();
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
initCluster();
show();
loadModel();
findCluster();
