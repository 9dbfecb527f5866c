set terminal png size 1000,480
set output 'timeline.png'
set title 'Live memory during one training step: rung after (planned, full scale)'
set xlabel 'allocator event'
set ylabel 'GB'
set grid
plot 'timeline.dat' using 1:2 with lines lw 2 title 'live bytes'
