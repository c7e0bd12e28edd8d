// The search page, offline (book/_ext/search_offline.py adds this and the pages' texts,
// window.miniparSearchPages, to search.html, before Sphinx's searchtools.js).
//
// 1. Snippets from file://. searchtools.js fetches each page it lists to cut a snippet from
//    it; a browser refuses fetch() from file://. A fetch of one of the book's pages is
//    answered here from the text the build wrote; any other goes to the network as before.
// 2. The glossary below the chapters. Each of its terms is an index entry, and an index
//    entry that is the query scores 100, above any chapter (a heading that holds the query
//    scores 15): the glossary came first for nearly every query. Its score is capped just
//    under a heading's, so the chapters whose sections are about the query come first, the
//    glossary's definition next, and pages that only mention the word after it. Among
//    equal scores Sphinx sorts by name; a result whose title holds the whole query (the
//    chapter "Tensor parallelism" for "tensor parallelism") goes first.
(function () {
  const pages = window.miniparSearchPages || {};
  const network = window.fetch ? window.fetch.bind(window) : null;
  const GLOSSARY = "book/glossary";

  // "book/memory" for <content root>/book/memory.html, else null.
  function pageOf(resource) {
    const root = new URL(document.documentElement.dataset.content_root || "./", location.href);
    const url = new URL(typeof resource === "string" ? resource : resource.url, location.href);
    if (!url.href.startsWith(root.href) || !url.pathname.endsWith(".html")) return null;
    const name = decodeURIComponent(url.href.slice(root.href.length).split(/[?#]/)[0]).slice(0, -5);
    return Object.prototype.hasOwnProperty.call(pages, name) ? name : null;
  }

  window.fetch = function (resource, init) {
    const name = pageOf(resource);
    if (name !== null)
      return Promise.resolve(new Response(pages[name], { headers: { "Content-Type": "text/html" } }));
    return network ? network(resource, init) : Promise.reject(new TypeError("no fetch"));
  };

  const query = (new URLSearchParams(location.search).get("q") || "").trim().toLowerCase();

  function score([docname, title, , , points]) {
    if (docname === GLOSSARY) return Math.min(points, 14);
    return query && String(title).toLowerCase().includes(query) ? points + 2 : points;
  }

  // Sphinx's own weights (searchtools.js keeps a Scorer defined before it), and the score
  // function above.
  window.Scorer = {
    objNameMatch: 11, objPartialMatch: 6,
    objPrio: { 0: 15, 1: 5, 2: -5 }, objPrioDefault: 0,
    title: 15, partialTitle: 7, term: 5, partialTerm: 2,
    score,
  };
})();
