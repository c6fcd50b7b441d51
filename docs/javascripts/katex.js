// Render the math pymdownx.arithmatex (generic mode) wraps in \( \) and \[ \], on every page load
// (document$ also fires after Material's instant navigation).
document$.subscribe(({ body }) => {
  renderMathInElement(body, {
    delimiters: [
      { left: "\\(", right: "\\)", display: false },
      { left: "\\[", right: "\\]", display: true },
    ],
    throwOnError: false,
  });
});
