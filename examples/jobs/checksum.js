// The SHA-256 of every file of a dataset, computed where the bytes are:
// `shoal job submit examples/jobs/checksum.js --dataset 'cluster:/photos/*'`.
// The output maps each path to its checksum (compare with `shoal stat`).
function mapper(files, emit) {
  for (var i = 0; i < files.length; i++) {
    job.abortIfCancelled();
    emit(files[i], fs.sha256(files[i]));
  }
}

function reducer(path, sums) {
  return sums[0];
}
