// The server's API with the key (--api-key) this browser holds: asked for on the first 401.
const KEY = "kvserve.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

let asking = null;

export function askForKey() {
  if (asking) return asking;
  const dialog = document.getElementById("key-dialog");
  const input = document.getElementById("key-input");
  input.value = apiKey();
  asking = new Promise((resolve) => {
    dialog.addEventListener("close", () => {
      if (dialog.returnValue === "save") localStorage.setItem(KEY, input.value.trim());
      asking = null;
      resolve(dialog.returnValue === "save");
    }, { once: true });
  });
  dialog.showModal();
  return asking;
}

// fetch with the key; a 401 asks for the key once and retries.
export async function apiFetch(path, options = {}) {
  let response = await fetch(path, { ...options, headers: headers(options.headers || {}) });
  if (response.status === 401 && (await askForKey())) {
    response = await fetch(path, { ...options, headers: headers(options.headers || {}) });
  }
  return response;
}

export async function apiJson(path) {
  const response = await apiFetch(path);
  if (!response.ok) {
    let message = `${response.status}`;
    try { message = (await response.json()).error.message; } catch { /* not JSON */ }
    throw new Error(message);
  }
  return response.json();
}
