// The dashboards' DOM helpers: elements built node by node (text never parsed as HTML), numbers, bars.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

export const num = (n) => n.toLocaleString("en-US");

export function bar(parts) {  // [[class, fraction], ...]
  return el("div", { class: "bar" }, ...parts.map(([cls, f]) => {
    const span = el("span", { class: cls });
    span.style.width = `${(100 * Math.min(1, f)).toFixed(1)}%`;  // CSSOM: the CSP forbids style attributes
    return span;
  }));
}
