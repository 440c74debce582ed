// Word count over a dataset: `shoal job submit examples/jobs/wordcount.js --dataset 'cluster:/books/**'`.
// Each map child counts the words of its files with the native fs.countWords (words are runs of
// ASCII letters, as `tr -cs A-Za-z '\n'` cuts them) and emits one pair per distinct word; the
// reduce sums them.
function mapper(files, emit) {
  var total = {};
  for (var i = 0; i < files.length; i++) {
    job.abortIfCancelled();
    mergeCounts(total, fs.countWords(files[i]));
    job.progress((i + 1) / files.length);
  }
  for (var w in total) {
    emit(w, total[w]);
  }
}

function reducer(word, counts) {
  var n = 0;
  for (var i = 0; i < counts.length; i++) {
    n += counts[i];
  }
  return n;
}
